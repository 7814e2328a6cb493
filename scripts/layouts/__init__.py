"""Engine export layouts (one module per drafter family); scripts/export.py dispatches."""
