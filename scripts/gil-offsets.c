/* Prints where a CPython keeps its GIL's state, for the Python whose
 * headers it is compiled against: the numbers of src/python/gil_state.rs
 * (`sample --gil` reads the GIL from outside). One line:
 *   VERSION runtime_gil=OFF|NONE interp_gil=OFF|NONE last_holder=OFF locked=OFF size=BYTES
 * runtime_gil: &_PyRuntime.ceval.gil (3.9-3.11, one GIL for the runtime);
 * interp_gil: the pointer interp->ceval.gil (3.12+, a GIL per interpreter).
 *
 * Build: cc -I$PREFIX/include/python3.X -I$PREFIX/include/python3.X/internal gil-offsets.c
 */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include <internal/pycore_interp.h>
#include <internal/pycore_runtime.h>
#if PY_VERSION_HEX >= 0x030C0000
#include <internal/pycore_gil.h>
#endif
int main(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    printf("%s runtime_gil=NONE interp_gil=%zu", PY_VERSION, offsetof(PyInterpreterState, ceval.gil));
#else
    printf("%s runtime_gil=%zu interp_gil=NONE", PY_VERSION, offsetof(_PyRuntimeState, ceval.gil));
#endif
    printf(" last_holder=%zu locked=%zu size=%zu\n", offsetof(struct _gil_runtime_state, last_holder), offsetof(struct _gil_runtime_state, locked), sizeof(struct _gil_runtime_state));
    return 0;
}
