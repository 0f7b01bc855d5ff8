// A CUDA module of another build, for the ABI check: it names the version
// as a module of another commit would (the version alone, as modules did
// before the interface hash), and has no backend to give.
extern "C" {

__attribute__((visibility("default"))) const char* dp_cuda_module_abi() {
  return "dp-cuda-module/1 dp-ps/" DP_VERSION;
}

__attribute__((visibility("default"))) void* dp_cuda_module_v1() {
  return nullptr;
}

}  // extern "C"
