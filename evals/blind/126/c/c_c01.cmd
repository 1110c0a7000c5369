python c_c01.py
