"""Launch, poll and kill attempts. Local spark-submit first; standalone, YARN and Kubernetes later."""
