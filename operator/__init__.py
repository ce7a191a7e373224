"""specfleet.operator: the InferenceService operator.

Pure core (`api`, `perfmodel`, `planner`, `render`, `status`, `catalogs`) and a thin kopf shell
(`handlers`, `main`). Nothing here imports torch.
"""
