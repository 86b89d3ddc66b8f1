"""The stages of a cell's search (base.py says what a stage is; pipeline.py which a cell has)."""
