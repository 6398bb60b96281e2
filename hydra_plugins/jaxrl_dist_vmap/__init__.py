"""`hydra/launcher=vmap`: jaxrl-dist's launcher, which trains the jobs of a sweep that
differ only in traced coefficients and seeds as one vmapped program."""
