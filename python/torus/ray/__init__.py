"""`python -m torus.ray SCRIPT [ARGS...]`: run a program written for Ray on Torus."""
