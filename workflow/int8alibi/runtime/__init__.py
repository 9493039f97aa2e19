"""What every stage process uses at run time, and no stage defines: the stage runner."""
