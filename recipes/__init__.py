"""draftsmith.recipes"""
