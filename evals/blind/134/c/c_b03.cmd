python c_b03.py
