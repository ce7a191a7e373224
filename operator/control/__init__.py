"""The control loop (docs/control.md): metrics windows, calibration and the pure autoscaling and speculation
policies (`window`, `calibration`, `autoscaler`, `speculation`, `coordinator`, `loop`), and its I/O
(`discovery` of engine pods, `scrape`: engine metrics in, `speculation_switch`: the admin POST out,
`runner`: one service's step, `scheduler`: when each service steps, `telemetry`: the operator's own metrics)."""
