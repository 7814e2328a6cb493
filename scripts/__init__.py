"""draftsmith.scripts"""
