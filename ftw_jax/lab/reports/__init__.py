"""Reports read from finished comparisons' files (nothing run, nothing trained): the logic of the scripts in
experiments/ that print them, each script a command line over one module here.

    comparison_summary  the README's comparison table and every FTW-minus-baseline test, side by side
    curve_ends          whether each method's learning curve still moves at the end of a run (slope t-tests)
    choice_ends         which chosen settings are an end of the values a method's tuning drew
    phase_records       what a comparison's finished phases say so far, from their records alone
    seed_groups         a comparison's reported seeds run as groups, then merged into the whole comparison

Errors are ValueErrors with one-line messages that name a setting in backquotes (`last`), never a flag.
"""
