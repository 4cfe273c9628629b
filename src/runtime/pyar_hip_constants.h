/* Constants whose values HIP and the CUDA driver API share.  Values that
 * differ between platforms or ROCm releases live in pyar_runtime's table
 * instead (see pyar_platform_values). */
#ifndef PYAR_HIP_CONSTANTS_H
#define PYAR_HIP_CONSTANTS_H

#define PYAR_hipSuccess 0
#define PYAR_hipErrorInvalidValue 1
#define PYAR_hipErrorNoDevice 100
#define PYAR_hipErrorNotReady 600
#define PYAR_hipErrorNotSupported 801
#define PYAR_hipErrorPeerAccessAlreadyEnabled 704

#define PYAR_hipMemcpyHostToHost 0
#define PYAR_hipMemcpyHostToDevice 1
#define PYAR_hipMemcpyDeviceToHost 2
#define PYAR_hipMemcpyDeviceToDevice 3
#define PYAR_hipMemcpyDefault 4

#define PYAR_hipStreamDefault 0
#define PYAR_hipStreamNonBlocking 1
#define PYAR_hipEventDefault 0
#define PYAR_hipEventDisableTiming 2
#define PYAR_hipHostMallocDefault 0

#define PYAR_hipStreamCaptureModeGlobal 0
#define PYAR_hipStreamCaptureModeThreadLocal 1
#define PYAR_hipStreamCaptureModeRelaxed 2
#define PYAR_hipStreamCaptureStatusNone 0
#define PYAR_hipStreamCaptureStatusActive 1
#define PYAR_hipStreamCaptureStatusInvalidated 2

#define PYAR_HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9

/* The stream-ordered pool keeps up to this many freed bytes for reuse. */
#define PYAR_hipMemPoolAttrReleaseThreshold 4
/* A kernel's resources (the CUDA driver API's CU_FUNC_ATTRIBUTE_* too). */
#define PYAR_HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES 3
#define PYAR_HIP_FUNC_ATTRIBUTE_NUM_REGS 4

#endif
