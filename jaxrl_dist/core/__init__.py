"""The math, pure: pytrees, networks, PPO (losses, GAE, update), rollout, normalisation, keys,
and the one learner every trainer and the scheduling MDP use.
"""
