# int8-alibi: are two scaled INT8 GEMM kernels interchangeable? A pre-registered pipeline.
# This file only sets up: the config, the fail-closed protocol gate, the rule files, rule all.
from snakemake.utils import min_version

min_version("8.0")


configfile: "config/config.yaml"


# `snakemake --report report.zip` (after a run): the project's report, its figures and main tables,
# each with the caption in workflow/report/.
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# Each stage's rule file, in the stage spec's order (int8alibi.stage_spec: a stage after those it reads).
for rule_file in dict.fromkeys(stage.rules_file for stage in stage_spec.STAGES):

    include: f"workflow/rules/{rule_file}"


include: "workflow/rules/report_figures.smk"


# Light jobs run where snakemake runs, never through a cluster's scheduler (with sharded faults, the
# gather is local too: faults.smk).
localrules:
    all,
    protocol,
    determinism,
    report,
    report_figures,
    crossmodel,


rule all:
    default_target: True
    input:
        final_targets(),


# What planning computed once for unchanged files (code digests, YAML parses): kept for the next plan.
save_plan_caches()
