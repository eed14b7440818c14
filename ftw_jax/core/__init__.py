"""The FTW core: the maths and data structures of Follow the Winners, pure functions over frozen pytrees.

    occupancy      which pool ranks an update keeps, exactly (Eq. 5)
    pool           the FIFO pool of trajectories (`Trajectory`, `Pool`)
    selection      J minibatches of C entries without replacement, the top K of each
    elite_loss     cross-entropy + β·KL over the kept trajectories
    stepwise       a loss summed over steps, its gradient taken on the steps that count alone
    update         select → loss → one Optax step if finite, one jit (`UpdateConfig`, `make_update`)
    losses, diagnostics, state, checks, settings, actions: what those are written with

Nothing here imports from a layer above it (algorithms, models, environments, programs, running, the CLI).
"""
