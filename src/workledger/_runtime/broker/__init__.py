"""Work through a broker: the messages owed and published (dispatch), and the task that runs
what a message names (delivery)."""
