"""Graph passes and the named pipeline that runs them."""
from .pipeline import PIPELINE, run_pipeline

__all__ = ["PIPELINE", "run_pipeline"]
