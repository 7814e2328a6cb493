"""Engine export layouts (one module per drafter family); ship/export.py dispatches."""
