/* ubitrain runtime: status codes returned by every generated function. */
#ifndef UB_STATUS_H
#define UB_STATUS_H

#define UB_OK 0
#define UB_ERR_NULL_ARGUMENT (-1)     /* a required pointer is NULL */
#define UB_ERR_ARENA_TOO_SMALL (-2)   /* the arena is smaller than UB_<MODEL>_ARENA_BYTES */
#define UB_ERR_ARENA_ALIGNMENT (-3)   /* the arena is not aligned to UB_<MODEL>_ARENA_ALIGN */
#define UB_ERR_NOT_INITIALIZED (-4)   /* the context was not set up by ub_<model>_init */
#define UB_ERR_LABEL_RANGE (-5)       /* a class label is outside [0, classes) */
#define UB_ERR_NONFINITE_LOSS (-6)    /* the loss is NaN or infinite; nothing was updated */
#define UB_ERR_INDEX (-7)             /* a tensor index is out of range */
#define UB_ERR_SIZE (-8)              /* a copy size does not match the tensor's size */
#define UB_ERR_STORAGE (-9)           /* the storage failed to read or write */
#define UB_ERR_NO_CHECKPOINT (-10)    /* no slot holds a complete, valid checkpoint */
#define UB_ERR_CHECKPOINT_MISMATCH (-11) /* the checkpoint is of another model or size */
#define UB_ERR_NO_PAGE_STORAGE (-12) /* the plan pages tensors and no storage was set */
#define UB_ERR_READ_ONLY (-13)       /* the tensor is frozen in flash; only its value fits */
#define UB_ERR_INDEX_RANGE (-14)     /* an embedding id of an input is outside its table */

#endif
