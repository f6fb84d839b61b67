// Loads an AOTInductor package (made by sparse_accumulation.export.export_for_aoti and
// torch._inductor.aoti_compile_and_package) and runs it on the CPU.
//
// usage: aoti_loader PACKAGE INPUTS
//   PACKAGE  the .pt2 file
//   INPUTS   a text file of the model's inputs, float64 tensors one after another, each written as its
//            number of dimensions, its sizes, then its values in row-major order (whitespace-separated)
// Prints every element of the first output (the energy), one per line, with 17 significant digits.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <vector>

static std::vector<at::Tensor> read_inputs(const char* path) {
  std::ifstream file(path);
  if (!file) {
    throw std::runtime_error(std::string("cannot read ") + path);
  }
  std::vector<at::Tensor> inputs;
  int64_t ndim;
  while (file >> ndim) {
    std::vector<int64_t> sizes(ndim);
    for (auto& size : sizes) {
      file >> size;
    }
    at::Tensor t = torch::empty(sizes, torch::kFloat64);
    double* values = t.data_ptr<double>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      file >> values[i];
    }
    if (!file) {
      throw std::runtime_error(std::string("truncated tensor in ") + path);
    }
    inputs.push_back(t);
  }
  return inputs;
}

int main(int argc, char* argv[]) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " PACKAGE INPUTS\n";
    return 2;
  }
  std::vector<at::Tensor> inputs = read_inputs(argv[2]);
  torch::inductor::AOTIModelPackageLoader loader(argv[1]);
  std::vector<at::Tensor> outputs = loader.run(inputs);

  at::Tensor energy = outputs.at(0).to(torch::kFloat64).contiguous().reshape({-1});
  for (int64_t i = 0; i < energy.numel(); ++i) {
    std::printf("%.17g\n", energy[i].item<double>());
  }
  return 0;
}
