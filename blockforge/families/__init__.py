"""The registered model families (importing this package registers them; `import blockforge` does)."""

from blockforge.families import llama, vit  # noqa: F401  (registration)
