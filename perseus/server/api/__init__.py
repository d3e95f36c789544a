"""The HTTP edge: routes, the dependencies they share, tokens, errors as answers, metrics, the
page."""
