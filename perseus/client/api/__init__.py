"""The rank's side of the planner's HTTP API: one request, its retries, and the planner client."""
