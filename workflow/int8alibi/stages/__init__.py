"""Stages: one module per pipeline stage, each a function from input paths to output paths.

Every stage module defines ``run(cfg, out_dir, **paths)`` and ends with
``if __name__ == "__main__": stage_main(run)`` (``int8alibi.runtime.runner``). Rules call
``python -m int8alibi.stages.<name>``. Stages are leaves: no module imports one, so a stage's code
digest covers only what that stage runs; what a stage's outputs mean to their readers (schemas,
file layouts, verdicts) lives in the domain modules both sides import.
"""
