python b_b03.py
