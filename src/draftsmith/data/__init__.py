"""Reading and rendering conversations: the data both training and the evaluator read."""
