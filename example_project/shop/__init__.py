"""The example's one app: its periodic tasks, and a table of their executions."""
