"""The files an `--format hf` export ships beside its weights for `trust_remote_code=True`.

configuration_blockforge.py and modeling_blockforge.py import only torch and transformers (never
blockforge), because they run wherever the exported folder is loaded. families/hf_export.py copies
them into the folder and registers them in config.json's `auto_map`.
"""
