"""The engine command that realises a simulated deployment (`--emit-launch`).

`data` reads each engine's own argument parser, kept as data with its version
(engines/launch/*.yaml) and chosen by an engine card's framework and version; `plan` says what a
simulated deployment assumed (layout, batch limits, memory, CUDA graphs, precision) in one
engine-neutral record; `vllm`, `sglang` and `trtllm` spell that record in their engine's flags,
refusing a layout the engine cannot express (each one's `check_layout`, which a layout search keeps
to as well: `build.layout_check`); `build` turns a run, a serving pool or a sweep row into a
`LaunchPlan`; `report` prints it.
"""
