rule generate:
    """One greedy generation artifact: one arm, one checkpoint, one fresh process."""
    input:
        gate=rules.requant.output.gate,
        protocol=protocol_files("determinism"),
    output:
        **stage_outputs("generate"),
    log:
        f"{LOGS}/generate/{{arm}}_{{checkpoint}}_{{run}}.log",
    benchmark:
        f"{BENCHMARKS}/generate/{{arm}}_{{checkpoint}}_{{run}}.tsv"
    wildcard_constraints:
        checkpoint="|".join(CHECKPOINT_VARIANTS),
        run="[12]",
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("generate")
    resources:
        **stage_resources("generate"),
    params:
        **stage_params("generate"),
        engine=ENGINE,
    shell:
        stage_cmd(
            "generate",
            f"{RESULTS}/determinism/runs/{{wildcards.arm}}/{{wildcards.checkpoint}}/run{{wildcards.run}}",
            "--input gate={input.gate} --param arm={wildcards.arm}"
            " --param checkpoint={wildcards.checkpoint} --param run={wildcards.run}"
            " --param engine={params.engine}",
        )
        + " 2> {log:q}"


rule determinism:
    """Agreement across arms and runs, joined under the identity contract (fails closed)."""
    input:
        runs=expand(
            stage_file("generate", "tokens"),
            arm=KERNEL_ARMS,
            checkpoint=CHECKPOINT_VARIANTS,
            run=[1, 2],
        ),
        protocol=protocol_files("determinism"),
    output:
        **stage_outputs("determinism"),
    log:
        f"{LOGS}/determinism.log",
    benchmark:
        f"{BENCHMARKS}/determinism.tsv"
    conda:
        software_env()
    threads: stage_threads("determinism")
    resources:
        **stage_resources("determinism"),
    params:
        **stage_params("determinism"),
    shell:
        stage_cmd("determinism", f"{RESULTS}/determinism", f"--input runs={qpath(f'{RESULTS}/determinism/runs')}")
        + " 2> {log:q}"
