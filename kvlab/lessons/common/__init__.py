"""What every lesson shares: claims (``claims``, ``checks``), exercises (``exercises``), the experiment panel
(``panel``), the prediction box and its fold (``predict``), the figure style and the Gantt chart several lessons draw."""
