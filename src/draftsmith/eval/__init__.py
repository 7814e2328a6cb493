"""draftsmith.eval"""
