"""The ship stage: engine exports (validated), the Hub upload and its model card."""
