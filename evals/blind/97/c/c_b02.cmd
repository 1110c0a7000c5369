python c_b02.py 49203
