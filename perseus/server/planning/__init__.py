"""Planning: the work a job's frontier takes, the worker processes that compute it, plans as ranks
fetch them."""
