"""The token-level analysis (preregistration/tokens.yaml): teacher-forced replay, margin as a flip predictor, check 7
at model level, and end-to-end fault injection.

``replay`` runs windows under several arms at once and compares them position by position;
``margin`` holds ROC-AUC with a cluster bootstrap and the calibrated margin -> flip map;
``check7`` the check itself; ``inject`` the reference and faulted arms of the injection;
``study`` replays every regime and builds the tables the tokens stage writes.
"""
