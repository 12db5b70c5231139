"""The worker half: runs the copies the scheduler half plans, times each step, and reports
what landed. It decides no policy."""
