"""The trainers (fused, sync rounds, async) and the run skeleton they share:
run directory, logger, checkpoints, records, summary.
"""
