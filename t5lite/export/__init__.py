"""Export to and import from Hugging Face `transformers` folders."""

from t5lite.export.hf import export_hf, hf_config, import_hf

__all__ = ['export_hf', 'hf_config', 'import_hf']
