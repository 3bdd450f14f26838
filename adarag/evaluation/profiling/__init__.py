"""The tools that build model profiles, run by the command line (never by serving code).

``adarag profile`` measures the attention sinks (:mod:`adarag.evaluation.profiling.sinks`);
``adarag calibrate`` records and fits the augmentation calibration
(:mod:`adarag.evaluation.profiling.calibration`). Serving reads the saved profiles through
:mod:`adarag.profiles`.
"""
