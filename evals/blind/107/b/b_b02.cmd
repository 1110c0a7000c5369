python b_b02.py 49111
