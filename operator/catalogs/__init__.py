"""The GPU and model catalogs (`gpus.yaml`, `models.yaml`); the loader and its types are in `loader.py`.
Measured engine profiles by (model, accelerator) are in `profiles/` (`profile_catalog.py`)."""
from specfleet.operator.catalogs.loader import (Gpu, GpuCatalog, ModelCatalog, gpus, models, normalize, parse_gpus,
                                                parse_models)
from specfleet.operator.catalogs.profile_catalog import NO_PROFILES, ProfileCatalog, profiles

__all__ = ["Gpu", "GpuCatalog", "ModelCatalog", "gpus", "models", "normalize", "parse_gpus", "parse_models",
           "NO_PROFILES", "ProfileCatalog", "profiles"]
