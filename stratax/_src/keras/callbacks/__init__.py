"""The Keras callbacks stratax adds: ``BackupAndRestore`` (step-level backups that resume
exactly), ``TensorBoard`` (written without TensorFlow) and ``WorkerMetrics`` (each worker's
step time, throughput, input and all-reduce).
"""
