"""Running: what every command needs to run a program and keep what it did.

    loop           members of one compiled program, period by period (`MemberRun`)
    signals        a stop asked for (SIGINT, SIGTERM): at the next checkpointed boundary, or within seconds
    memory         budgets: a state or program refused before it is allocated where it would not fit
    host           the members' axis over devices and hosts, and host copies of it
    run_files      a run folder's files, written atomically
    provenance     the code a record was written by: its git commit, the package versions, the command line
    checkpoints    Orbax checkpoints of a run's carry and record (`CheckpointSettings`, `Checkpointer`)
    skips          skipped optimizer steps counted, and the stop of a run that applies none
    timing         wall-clock seconds of device work, waited for (the benchmarks')
    plots, compile_cache, threefry: curves, the compilation cache, the faster CPU lowering (opt in)

Nothing here imports the command line, nor a program (the loop runs any `Program`).
"""
