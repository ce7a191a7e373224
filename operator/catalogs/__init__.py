"""The GPU and model catalogs (`gpus.yaml`, `models.yaml`); the loader and its types are in `loader.py`."""
from specfleet.operator.catalogs.loader import (Gpu, GpuCatalog, ModelCatalog, gpus, models, normalize, parse_gpus,
                                                parse_models)

__all__ = ["Gpu", "GpuCatalog", "ModelCatalog", "gpus", "models", "normalize", "parse_gpus", "parse_models"]
