python c_c01.py --port 38207
