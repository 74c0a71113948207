"""`specdec profile`: where a speculation round's time goes, from its spans."""
