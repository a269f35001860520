"""Energy estimators for stochastic-gradient parallel tempering."""
