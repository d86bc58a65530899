"""Relax → TIR: legalize graph ops into PrimFuncs, schedule and lower them to flat loops."""
