"""The rebalance replay: journals or synthetic churn through every strategy (``mqbalance replay``).

Pure modules (no Spark): ``events`` (journal lines and events), ``synthetic`` (churn),
``replay`` (the single-process reference), ``scoring`` (totals and recommendations),
``report`` (the HTML report), ``sample_journal``. ``spark_job`` holds the Spark
transforms and ``main`` the command; only they import pyspark.
"""
