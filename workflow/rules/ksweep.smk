rule ksweep:
    input:
        protocol=protocol_files("ksweep"),
    output:
        **stage_outputs("ksweep"),
    log:
        f"{LOGS}/ksweep.log",
    benchmark:
        f"{BENCHMARKS}/ksweep.tsv"
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("ksweep")
    resources:
        **stage_resources("ksweep"),
    params:
        **stage_params("ksweep"),
    shell:
        stage_cmd("ksweep", f"{RESULTS}/ksweep") + " 2> {log:q}"
