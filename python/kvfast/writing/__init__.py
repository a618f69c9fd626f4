"""Writing states: :func:`kvfast.write` (:mod:`.write`), the cells it keeps or drops (:mod:`.cells`)
and the token records it writes (:mod:`.tokens`); every file kvfast writes at a path it is given,
checked and renamed into place (:mod:`.output`).

The folder is ``writing``, not ``write``: ``kvfast.write`` is the function, and a package of that
name would be hidden behind it (``kvfast.write.cells`` an AttributeError).
"""
