"""draftsmith.models"""
