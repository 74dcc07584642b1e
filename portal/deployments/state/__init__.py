"""Pure decisions and the typed state they work on: rollout limits, the rollout step,
autoscaling and healing. They import nothing else of the app, so every room above may use them.
"""
