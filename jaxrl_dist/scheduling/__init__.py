"""How many shards a round runs and what it costs: schedulers, the cost model,
latency profiles, the scheduling MDP and the learned scheduler.
"""
