"""draftsmith.train.core"""
