"""The benchmark harness behind ``adarag bench``: policies, workloads, runs and reports."""
